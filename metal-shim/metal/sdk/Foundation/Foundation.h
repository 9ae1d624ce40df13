/*
 * Checking stand-in for Apple's <Foundation/Foundation.h>, for metal-shim's
 * Linux syntax check only (see objc/NSObject.h). Only the classes, methods and
 * functions metal-shim/metal/*.m call are declared; each matches the public
 * SDK's selector, argument and return types and nullability. A selector that
 * is missing here is an error in the check: add it only after reading the
 * SDK header that declares it.
 */
#pragma once
#include <stdarg.h>
#import <objc/NSObject.h>
#import <dispatch/dispatch.h>

NS_ASSUME_NONNULL_BEGIN

@class NSString, NSData, NSArray<ObjectType>, NSDictionary<KeyType, ObjectType>, NSDate, NSError;

typedef double NSTimeInterval;
typedef unsigned short unichar;

/* ---- NSObjCRuntime / NSRange ------------------------------------------ */

typedef NS_ENUM(NSInteger, NSComparisonResult) {
  NSOrderedAscending = -1L,
  NSOrderedSame = 0,
  NSOrderedDescending = 1,
};
typedef NSComparisonResult (^NSComparator)(id obj1, id obj2);
static const NSInteger NSNotFound = NSIntegerMax;

typedef struct _NSRange {
  NSUInteger location;
  NSUInteger length;
} NSRange;
static inline NSRange NSMakeRange(NSUInteger loc, NSUInteger len) {
  NSRange r;
  r.location = loc;
  r.length = len;
  return r;
}

/* NSZone.h: the VM page size of this process (16384 on Apple silicon), and
 * page-granular zero-filled allocations. */
FOUNDATION_EXPORT NSUInteger NSPageSize(void);
FOUNDATION_EXPORT void *NSAllocateMemoryPages(NSUInteger bytes);
FOUNDATION_EXPORT void NSDeallocateMemoryPages(void *ptr, NSUInteger bytes);

/* ---- protocols ----------------------------------------------------------- */

@protocol NSCopying
- (id)copyWithZone:(nullable NSZone *)zone;
@end
@protocol NSMutableCopying
- (id)mutableCopyWithZone:(nullable NSZone *)zone;
@end

typedef struct {
  unsigned long state;
  id __unsafe_unretained _Nullable *_Nullable itemsPtr;
  unsigned long *_Nullable mutationsPtr;
  unsigned long extra[5];
} NSFastEnumerationState;

@protocol NSFastEnumeration
- (NSUInteger)countByEnumeratingWithState:(NSFastEnumerationState *)state
                                  objects:(id __unsafe_unretained _Nullable[_Nonnull])buffer
                                    count:(NSUInteger)len;
@end

/* ---- strings ------------------------------------------------------------- */

typedef NSUInteger NSStringEncoding;
static const NSStringEncoding NSUTF8StringEncoding = 4;

typedef NS_OPTIONS(NSUInteger, NSStringCompareOptions) {
  NSCaseInsensitiveSearch = 1,
  NSLiteralSearch = 2,
  NSBackwardsSearch = 4,
};

@interface NSCharacterSet : NSObject <NSCopying, NSMutableCopying>
@property (readonly, class, copy) NSCharacterSet *whitespaceCharacterSet;
@end

@interface NSString : NSObject <NSCopying, NSMutableCopying>
@property (readonly) NSUInteger length;
- (unichar)characterAtIndex:(NSUInteger)index;
+ (instancetype)string;
+ (instancetype)stringWithString:(NSString *)string;
+ (nullable instancetype)stringWithUTF8String:(const char *)nullTerminatedCString;
+ (instancetype)stringWithFormat:(NSString *)format, ... NS_FORMAT_FUNCTION(1, 2);
- (instancetype)initWithFormat:(NSString *)format arguments:(va_list)argList NS_FORMAT_FUNCTION(1, 0);
+ (nullable instancetype)stringWithContentsOfFile:(NSString *)path
                                         encoding:(NSStringEncoding)enc
                                            error:(NSError **)error;
@property (nullable, readonly) const char *UTF8String;
- (NSUInteger)lengthOfBytesUsingEncoding:(NSStringEncoding)enc;
- (nullable NSData *)dataUsingEncoding:(NSStringEncoding)encoding;
- (nullable NSData *)dataUsingEncoding:(NSStringEncoding)encoding allowLossyConversion:(BOOL)lossy;
- (BOOL)isEqualToString:(NSString *)aString;
- (BOOL)hasPrefix:(NSString *)str;
- (BOOL)hasSuffix:(NSString *)str;
- (NSComparisonResult)compare:(NSString *)string options:(NSStringCompareOptions)mask;
- (NSRange)rangeOfString:(NSString *)searchString;
- (NSRange)rangeOfString:(NSString *)searchString options:(NSStringCompareOptions)mask range:(NSRange)rangeOfReceiverToSearch;
- (NSString *)substringFromIndex:(NSUInteger)from;
- (NSString *)substringToIndex:(NSUInteger)to;
- (NSString *)substringWithRange:(NSRange)range;
- (NSArray<NSString *> *)componentsSeparatedByString:(NSString *)separator;
- (NSString *)stringByTrimmingCharactersInSet:(NSCharacterSet *)set;
@property (readonly) long long longLongValue;  /* NSString.h (NSStringExtensionMethods) */
- (NSString *)stringByReplacingOccurrencesOfString:(NSString *)target withString:(NSString *)replacement;
/* NSPathUtilities.h */
@property (readonly, copy) NSString *lastPathComponent;
- (NSString *)stringByAppendingPathComponent:(NSString *)str;
@end

@interface NSMutableString : NSString
- (void)appendString:(NSString *)aString;
- (void)appendFormat:(NSString *)format, ... NS_FORMAT_FUNCTION(1, 2);
@end

/* ---- data ------------------------------------------------------------------ */

@interface NSData : NSObject <NSCopying, NSMutableCopying>
@property (readonly) NSUInteger length;
@property (readonly) const void *bytes NS_RETURNS_INNER_POINTER;
- (void)getBytes:(void *)buffer length:(NSUInteger)length;
@end

@interface NSMutableData : NSData
+ (nullable instancetype)dataWithCapacity:(NSUInteger)aNumItems;
@property (readonly) void *mutableBytes;
- (void)appendBytes:(const void *)bytes length:(NSUInteger)length;
- (void)appendData:(NSData *)other;
@end

/* ---- errors ------------------------------------------------------------------ */

typedef NSString *NSErrorDomain;
typedef NSString *NSErrorUserInfoKey;
@interface NSError : NSObject <NSCopying>
@property (readonly, copy) NSErrorDomain domain;
@property (readonly) NSInteger code;
@property (readonly, copy) NSDictionary<NSString *, id> *userInfo;
@property (readonly, copy) NSString *localizedDescription;
@end

/* ---- collections ----------------------------------------------------------- */

@interface NSArray<__covariant ObjectType> : NSObject <NSCopying, NSMutableCopying, NSFastEnumeration>
+ (instancetype)arrayWithObject:(ObjectType)anObject;
@property (readonly) NSUInteger count;
- (ObjectType)objectAtIndex:(NSUInteger)index;
- (ObjectType)objectAtIndexedSubscript:(NSUInteger)idx;
@property (nullable, nonatomic, readonly) ObjectType firstObject;
@property (nullable, nonatomic, readonly) ObjectType lastObject;
- (BOOL)containsObject:(ObjectType)anObject;
- (NSArray<ObjectType> *)sortedArrayUsingComparator:(NSComparator NS_NOESCAPE)cmptr;
- (NSString *)componentsJoinedByString:(NSString *)separator;
@end

@interface NSMutableArray<ObjectType> : NSArray<ObjectType>
+ (instancetype)array;
+ (instancetype)arrayWithCapacity:(NSUInteger)numItems;
- (void)addObject:(ObjectType)anObject;
- (void)removeObjectAtIndex:(NSUInteger)index;
- (void)removeAllObjects;
- (void)replaceObjectAtIndex:(NSUInteger)index withObject:(ObjectType)anObject;
- (void)setObject:(ObjectType)obj atIndexedSubscript:(NSUInteger)idx;
@end

/* NSValue.h */
@interface NSNumber : NSObject <NSCopying>
+ (NSNumber *)numberWithInteger:(NSInteger)value;
@property (readonly) NSInteger integerValue;
@end

/* NSNull.h: the object that stands for nil in collections. */
@interface NSNull : NSObject <NSCopying>
+ (NSNull *)null;
@end

/* NSKeyValueCoding.h: sets a property by name (what a newer SDK declares, an older one can still set). */
@interface NSObject (NSKeyValueCoding)
- (void)setValue:(nullable id)value forKey:(NSString *)key;
@end

/* NSURL.h */
@interface NSURL : NSObject <NSCopying>
+ (NSURL *)fileURLWithPath:(NSString *)path;
@end

/* NSPathUtilities.h */
extern NSString *NSHomeDirectory(void);

/* NSObjCRuntime.h */
extern SEL NSSelectorFromString(NSString *aSelectorName);

@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject <NSCopying, NSMutableCopying, NSFastEnumeration>
@property (readonly) NSUInteger count;
- (nullable ObjectType)objectForKey:(KeyType)aKey;
- (nullable ObjectType)objectForKeyedSubscript:(KeyType)key;
@property (readonly, copy) NSArray<KeyType> *allKeys;
@end

@interface NSMutableDictionary<KeyType, ObjectType> : NSDictionary<KeyType, ObjectType>
+ (instancetype)dictionary;
- (void)setObject:(ObjectType)anObject forKey:(KeyType<NSCopying>)aKey;
- (void)setObject:(nullable ObjectType)obj forKeyedSubscript:(KeyType<NSCopying>)key;
- (void)removeObjectForKey:(KeyType)aKey;
- (void)removeAllObjects;
@end

@interface NSMutableSet<ObjectType> : NSObject <NSCopying, NSMutableCopying, NSFastEnumeration>
+ (instancetype)set;
@property (readonly) NSUInteger count;
- (BOOL)containsObject:(ObjectType)anObject;
- (void)addObject:(ObjectType)object;
@end

/* ---- files, processes, time ---------------------------------------------- */

@interface NSFileManager : NSObject
@property (class, readonly, strong) NSFileManager *defaultManager;
- (nullable NSArray<NSString *> *)contentsOfDirectoryAtPath:(NSString *)path error:(NSError **)error;
- (BOOL)fileExistsAtPath:(NSString *)path;
- (BOOL)createDirectoryAtPath:(NSString *)path
    withIntermediateDirectories:(BOOL)createIntermediates
                     attributes:(nullable NSDictionary<NSString *, id> *)attributes
                          error:(NSError **)error;
@end

@interface NSProcessInfo : NSObject
@property (class, readonly, strong) NSProcessInfo *processInfo;
@property (readonly, copy) NSDictionary<NSString *, NSString *> *environment;
@property (readonly) unsigned long long physicalMemory;
@property (readonly) NSTimeInterval systemUptime;
@end

@interface NSDate : NSObject <NSCopying>
+ (instancetype)dateWithTimeIntervalSinceNow:(NSTimeInterval)secs;
@end

/* ---- locks ------------------------------------------------------------------ */

@protocol NSLocking
- (void)lock;
- (void)unlock;
@end

@interface NSLock : NSObject <NSLocking>
@end

/* A mutex with a condition variable. */
@interface NSCondition : NSObject <NSLocking>
- (void)wait;
- (BOOL)waitUntilDate:(NSDate *)limit;
- (void)signal;
- (void)broadcast;
@end

NS_ASSUME_NONNULL_END
